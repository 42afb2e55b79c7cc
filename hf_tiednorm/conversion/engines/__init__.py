"""Engine adapters: serving a plain export with an engine nobody here wrote (``onnx``: torch's ONNX exporter and ONNX
Runtime; ``llama_cpp``: llama.cpp's GGUF converter and llama-cpp-python). Each needs its engine installed; importing
this package imports neither."""
