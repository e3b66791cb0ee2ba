"""The Ray layer of raytune-kernels: thin actors over the Ray-free core `raytune_kernels`.

Actors arrive with the pipeline issue (builders, measurers, scheduler, cost model, layout).
"""
