"""`python -m lara_serve.model_export.export --model NAME`: see `exporter`."""

from lara_serve.model_export.export.exporter import main

if __name__ == "__main__":
    main()
