"""gen_timeline: timeline files (TensorFlow StepStats) -> Chrome trace JSON and op summaries."""
