.PHONY: run test image bench lint

# Bring the whole system up on this machine at http://127.0.0.1:$(PORT) (default 8000).
run:
	scripts/run.sh

# Install what is missing, start the services the tests need, and run the whole suite.
test:
	scripts/test.sh

# Build the default sandbox image from Debian packages (no registry needed).
image:
	scripts/build-image.sh --force

# Run every benchmark and write bench/README.md.
bench:
	scripts/bench.sh

# Fix what can be fixed automatically.
lint:
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .
