"""Built-in environments (installed as ``leanrl.environments``). ``leanrl envs`` lists them."""
