"""Code generation: loop-nest IR, lowering of task computes, LLVM rendering and building."""
