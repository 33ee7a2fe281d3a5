from trtforge.cli import entry

entry()
