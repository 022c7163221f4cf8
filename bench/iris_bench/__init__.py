"""iris-bench: the serving benchmark of iris (see bench/iris-bench and DESIGN.md)."""
