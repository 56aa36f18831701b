"""The only layer that starts ansible or imports the collection's code: runner, inventory, loader."""
