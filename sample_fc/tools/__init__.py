"""Command-line tools, each `python -m sample_fc.tools.<name> --help`:

    verify     verification accuracy of a trained backbone on .bin pair sets
    embed      embeddings of a folder of images
    export     ONNX export, checked against MXNet with onnxruntime
    pack       a folder of identity subfolders -> insightface RecordIO
    make_bin   a pairs list -> a verification .bin
    demo_data  the built-in synthetic demo dataset
    plan       what a run needs per worker (bank, step, backbone, checkpoint) and whether it fits
    ijb        IJB-B / IJB-C 1:1 verification (TAR@FAR) of a trained backbone
    align      raw photos -> aligned face crops (MTCNN's 5 landmarks, the 5-point template)
model_io holds the --model options of verify/embed/export/ijb; cli holds what the tools share
(the parser, the one-line exit 2 for a UsageError, the output checks, the progress lines).
"""
