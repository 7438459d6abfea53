from rlfarm.cli import main

if __name__ == "__main__":  # a spawned child process re-imports this module: it must not run the CLI again
    main()
