"""Model sources and families: which model, from where, and how it embeds or scores.

A Hugging Face id or a directory becomes a snapshot directory (source.py); what the directory holds is read
(files.py) into the family preset that decides pooling, prompts and limits (families.py). Each family is one spec
(spec.py's FamilySpec) in its own module under specs/: how it is detected and read, its prompts and templates, the
outputs it gives and how it scores; the rest of the package asks ``ModelFamily.spec`` and never names a family.
The first stage of the data path: everything after it reads a ModelFamily.

May import: errors
Engine libraries: none
"""
