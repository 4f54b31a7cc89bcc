"""One module per way of reading a heap; entry.inspect chooses among them."""
