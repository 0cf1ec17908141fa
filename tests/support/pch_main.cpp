// The target that builds the tests' shared precompiled header (test_pch.hpp); it runs nothing.
int main() { return 0; }
