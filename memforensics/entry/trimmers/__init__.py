"""One module per way of calling into an allocator to give memory back; entry.trim
chooses among them."""
