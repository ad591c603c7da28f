"""Local demo and test harness: a real Triton server from the nvidia-pytriton wheel."""
