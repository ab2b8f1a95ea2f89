limits {
  max_output_bytes_per_uid = 67108865
}
