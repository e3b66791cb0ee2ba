"""The Ray layer of raytune-kernels: thin actors over the Ray-free core `raytune_kernels`.

Builders and measurers (measure_actors, cuda_builder, gpu_measure) run under the measuring
pipeline (pipeline); the task scheduler, search and cost model actors (tuning_actors) run
the core's Tuner; the layout actor (layout_actor) solves compile_network's layout problem;
driver starts a tuning run from raytune_kernels.tune_network / tune_tasks. Every module
here imports the core modules it needs directly, never the package `raytune_kernels`.
"""
