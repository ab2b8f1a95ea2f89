limits {
  max_output_bytes = 1000
}
