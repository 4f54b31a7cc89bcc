"""Core files of dead x86-64 processes: notes, mappings and memory, read from the file."""
