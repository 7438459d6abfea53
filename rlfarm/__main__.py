from rlfarm.cli import run

if __name__ == "__main__":  # a spawned child process re-imports this module: it must not run the CLI again
    run()
