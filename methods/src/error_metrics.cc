// filled by the methods work
