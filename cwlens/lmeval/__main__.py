from cwlens.lmeval.cli import main

main()
