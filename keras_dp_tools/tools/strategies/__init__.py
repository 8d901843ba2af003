"""Which distribution strategy for this model, on this machine: ``compare_strategies``
trains the same model under each candidate (one device, MirroredStrategy,
CentralStorageStrategy, MultiWorkerMirroredStrategy, ParameterServerStrategy), each in
its own processes, and says which is fastest and why the others lose."""
