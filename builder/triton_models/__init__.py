"""model.py files of the python-backend models the builder copies into the repository."""
