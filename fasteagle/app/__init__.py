"""The glue between the Gradio page (`app.py`) and the library: the engine that decodes, the line at
the one decoder, the example cache, the page's words and its event handlers, and the load test."""
