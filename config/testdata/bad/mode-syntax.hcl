socket {
  mode = "rw-rw----"
}
