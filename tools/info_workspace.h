#ifndef MOEA2A_INFO_WORKSPACE_H
#define MOEA2A_INFO_WORKSPACE_H
/* Prints the workspace of spec ("ep=32,hidden=7168,..."); returns an exit status. */
int info_workspace(const char *spec);
#endif
