"""Train a face-recognition embedding with Partial FC (placeholder until the training issue)."""
import sys

if __name__ == "__main__":
    print("sample_fc train.py: the training pipeline is not built yet; it will train with",
          " ".join(sys.argv[1:]))
