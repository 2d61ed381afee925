"""captioner: Show, Attend and Tell image captioning with soft, hard and Transformer attention."""
__version__ = "0.1.0"
