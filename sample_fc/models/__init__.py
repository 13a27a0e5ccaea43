"""Trained backbones in and out, one module per file format.

    saved_model.py     MXNet's symbol JSON + .params; finds a model (prefix, checkpoint, models root),
                       loads it for the tools and --pretrained, dispatching .pth and .onnx below
    torch_weights.py   arcface_torch's backbone.pth, read without running pickle code
    torch_backbone.py  a .pth's tensors mapped onto our networks
    onnx_model.py      .onnx models: run with onnxruntime, their weights read for --pretrained
"""
