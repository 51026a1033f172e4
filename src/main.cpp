// clairfs: a read-only FUSE file system that stages training data ahead of the reader.
#include "cli.hpp"

int main(int argc, char** argv) { return clairfs::run_cli(argc, argv); }
