"""Built-in runtimes (installed as ``leanrl.runtimes``)."""
