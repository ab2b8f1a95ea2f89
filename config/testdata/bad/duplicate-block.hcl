socket {
  mode = "0600"
}

socket {
  mode = "0660"
}
