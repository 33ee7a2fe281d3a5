from trtforge.cli import main

main()
