"""The special tokens every vocabulary starts with, and their indices: a leaf module, so that the models (which
mask padding) and the data (which builds vocabularies) both read them without depending on each other."""

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_INDEX, START_INDEX, END_INDEX, UNK_INDEX = range(4)
