"""Drop-in call-compatible front ends of dsv4's ops for code written against other libraries."""
