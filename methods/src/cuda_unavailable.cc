// filled by the CUDA work: the build without CUDA
