"""Commands whose code lives in no domain module: each module is one command's flags and its `main(argv) -> int`,
so the data, study and training modules below hold no argument parsing."""
