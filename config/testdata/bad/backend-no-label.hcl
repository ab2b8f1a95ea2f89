backend {}
