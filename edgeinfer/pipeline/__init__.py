"""The pipeline: capture → preprocess → infer → postprocess on two threads, and its tasks."""
