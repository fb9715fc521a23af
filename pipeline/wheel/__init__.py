"""Reading and writing wheels: archives, ELF files, offload bundles and search paths."""
