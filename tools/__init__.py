"""Project tools that are not part of the served product: the MkDocs hook, the screenshot script."""
