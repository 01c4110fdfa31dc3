// filled by the CUDA work
