import sys

from raytune_kernels.cli import main

sys.exit(main())
