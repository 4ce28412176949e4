"""Model sources and families: which model, from where, and how it embeds or scores.

A Hugging Face id or a directory becomes a snapshot directory (source.py); what the directory holds is read
(files.py) into the family preset that decides pooling, prompts and limits (families.py, with each family's prompts
and templates in family_prompts.py). The first stage of the data path: everything after it reads a ModelFamily.

May import: errors
Engine libraries: none
"""
