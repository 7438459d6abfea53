from rlfarm.cli import main

main()
