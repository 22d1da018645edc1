"""datatrove blocks for reading, identifying and splitting raw corpora."""
