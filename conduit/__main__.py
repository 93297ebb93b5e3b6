from conduit.cli import main

main()
