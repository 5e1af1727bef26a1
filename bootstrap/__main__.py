from bootstrap.cli import run

run()
