"""Caller input to token ids: texts are checked and chunked, put into the family's prompts, then tokenized with the
caller's truncation.

inputs.py checks what callers pass (texts, queries, truncation, dimensions) and cuts streams into chunks;
prompts.py gives each text or (query, document) pair the prompt its family reads and says how a family scores;
tokens.py turns prompts into token ids (transformers' tokenizer, imported with the first local engine). The remote
client stops after prompts.py and sends text. images.py checks and decodes caller images (PIL, pathlib.Path, bytes)
for image-text models.

May import: models
Engine libraries: transformers (deferred)
"""
