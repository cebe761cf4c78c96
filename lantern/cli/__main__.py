from lantern.cli.main import main

main()
