"""Built-in harnesses (installed as ``leanrl.harnesses``)."""
