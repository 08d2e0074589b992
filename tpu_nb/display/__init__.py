"""tpu_nb.display: HTML/SVG/text rendering, widgets and charts over runtime data (never
IPython magics)."""
