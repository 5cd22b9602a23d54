"""Dense linear algebra on the GPU: `gemv.gemv` (y = A @ x, with autotune) and
`matmul.matmul` (C = A @ B)."""
