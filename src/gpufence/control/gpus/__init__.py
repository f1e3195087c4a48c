"""This machine's GPUs: NVML access, discovery (real or fake), the node spec built from it, how
busy a job's GPUs are, and what ``CUDA_VISIBLE_DEVICES`` a process gets."""
