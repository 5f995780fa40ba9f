"""The experiment's configuration: structured schemas (:mod:`.schema`), Hydra composition
(:mod:`.compose`), the algorithm list (:mod:`.algorithms`). Importing this package loads
nothing; import the module you need."""
