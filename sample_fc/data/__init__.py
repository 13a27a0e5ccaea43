"""Data: training iterators, the insightface RecordIO layout (read and write), verification
.bin files, and the one image decode/encode with the one list of image extensions."""
from .bin_format import load_bin, write_bin
from .images import IMAGE_EXTENSIONS, decode_rgb, encode_jpeg
from .iterators import DataError, FaceRecordIter, SyntheticIter
from .recordio import RecordWriter, open_record, read_property

__all__ = ["DataError", "FaceRecordIter", "IMAGE_EXTENSIONS", "RecordWriter", "SyntheticIter", "decode_rgb",
           "encode_jpeg", "load_bin", "open_record", "read_property", "write_bin"]
