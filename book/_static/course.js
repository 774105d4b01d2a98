// sphinx-book-theme 1.4 draws its own sidebar buttons in the article's header, while the theme scripts (its own and
// pydata-sphinx-theme's) listen on the first `.primary-toggle` / `.secondary-toggle` of the page only: the hidden
// one of pydata's header. A click on the visible button is handed to that one, so the menu opens (a dialog on a
// narrow screen, the sidebar folds on a wide one). tests/test_book.py opens it at 390 px.
document.addEventListener("click", (event) => {
  for (const name of ["primary-toggle", "secondary-toggle"]) {
    const clicked = event.target.closest("." + name);
    const listened = document.querySelector("." + name);
    if (clicked && listened && clicked !== listened) {
      event.preventDefault();
      event.stopPropagation();
      listened.click();
      return;
    }
  }
}, true);
